"""The run dir's files as typed records: its layout, lock, summary, trainer progress, a failed rank's record."""
