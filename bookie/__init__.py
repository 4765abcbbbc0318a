"""minipulsar bookie package."""
