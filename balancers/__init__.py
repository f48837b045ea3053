"""Mediator-less load balancers: which one of the eligible instances to use.

The base class and the built-ins arrive with the resolution issue; a user's own balancer will
live beside them and look the same.
"""
