"""minipulsar broker/replication package."""
