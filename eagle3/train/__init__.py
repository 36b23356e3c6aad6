"""The rank process: start, the loop, its cadence, stop, tracking, on-policy training, measured acceptance at val."""
