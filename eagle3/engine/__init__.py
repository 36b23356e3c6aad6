"""The serving engine's environment: its venv (vLLM, SpecForge) and the server process."""
