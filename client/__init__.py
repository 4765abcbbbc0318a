"""minipulsar client package."""
