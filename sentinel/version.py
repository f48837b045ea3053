"""The installed distribution's version."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("sentinel-discovery")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0+unknown"
