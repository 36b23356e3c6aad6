"""eagle3: config-driven training of EAGLE-3 draft models on speculators (docs/development.md maps the layout)."""
