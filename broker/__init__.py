"""minipulsar broker package."""
