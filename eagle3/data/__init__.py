"""Datasets: the data sources, preparing speculators-format data, checking it, reading it back, regenerating rows."""
