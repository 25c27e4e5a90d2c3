"""Evaluation: prediction records, honest accuracy accounting, reports."""
