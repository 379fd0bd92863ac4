"""Reliability: small replays with the byte oracle while a fault is present or injected (bad objects
under page names, a store that turns read-only, a Mooncake master restart). Each asserts that every
request is served, no page is wrong, and nothing is left behind after close."""
