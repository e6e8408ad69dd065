"""ddptrainer: the DDP training program in the trainer image (never imports kopf or kubernetes)."""
__version__ = "0.1.0"
