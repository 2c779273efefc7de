"""Pure tensor functions of the RL algorithms, each registered by name."""
