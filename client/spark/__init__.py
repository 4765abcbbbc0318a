"""minipulsar client/spark package."""
