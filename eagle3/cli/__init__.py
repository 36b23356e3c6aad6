"""The project's commands (argparse front ends over the library below)."""
