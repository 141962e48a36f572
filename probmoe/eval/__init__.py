"""Benchmark scoring without a model: GSM8K answer extraction and checking (``gsm8k``)."""

from .gsm8k import MODES, extract_answer, gold_answer, is_correct

__all__ = ["MODES", "extract_answer", "gold_answer", "is_correct"]
