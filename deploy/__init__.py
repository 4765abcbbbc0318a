"""minipulsar deploy package."""
