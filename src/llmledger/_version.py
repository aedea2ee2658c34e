"""The package's version, in a module of its own so the ledger can stamp migrations without importing the
package's public surface (hatchling reads it from here too)."""

__version__ = "0.9.0"
