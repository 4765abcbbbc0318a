"""minipulsar broker/metadata package."""
