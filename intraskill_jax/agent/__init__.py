"""The multi-turn agent loop: simulator episodes as token-in-token-out trajectories."""
