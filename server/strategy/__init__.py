"""The algorithm: the base Strategy, aggregation maths, reply checks, the site roster, DP and secure aggregation."""
