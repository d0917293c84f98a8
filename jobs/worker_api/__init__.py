"""The worker API: what the ranks of an attempt send (heartbeats, metrics,
checkpoints, events, profiles) and how it is checked and stored."""
