"""minipulsar broker/service package."""
