"""The worker side: everything that runs inside one cell's process."""
