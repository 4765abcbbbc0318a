"""minipulsar broker/ledger package."""
