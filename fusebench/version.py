"""The package version, in a leaf module: results/env.py records it without importing the
package root (which imports results/ for load_results)."""
__version__ = "0.1.0"
