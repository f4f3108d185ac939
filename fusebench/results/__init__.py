"""Results documents (versioned), environment metadata, frames, statistics, compare."""
