"""eagle3: config-driven training of EAGLE-3 draft models on speculators (see README.md for the layout)."""
