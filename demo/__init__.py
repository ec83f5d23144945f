"""A small demo for `make run`: an `orders` stream with groups `email` and `points`."""
