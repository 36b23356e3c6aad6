"""Which device, backend, dtype and attention a run uses; process groups and DDP/FSDP2 wrapping."""
