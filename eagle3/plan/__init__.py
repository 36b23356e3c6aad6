"""What a run asks of this machine: the memory and time plan, the sizes it reads, the measured kernel rates."""
