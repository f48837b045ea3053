"""Selection policies: which of a partition's instances are eligible.

The base class and the built-ins arrive with the resolution issue; a user's own policy will
live beside them and look the same.
"""
