"""Low readers and writers of files: tensor headers, hidden-state files, rows files and row formats, vocab maps,
build-once cache dirs, free disk space; the packing of rows into micro-batches and steps."""
