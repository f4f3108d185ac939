"""Tables and plots: what a person reads."""
