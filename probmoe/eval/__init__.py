"""Evaluation: GSM8K answer extraction and checking without a model (``gsm8k``, imported here),
greedy GSM8K generation and scoring of a checkpoint behind ``probmoe-eval`` (``generation``), the
LM Evaluation Harness model (``harness``, the ``eval`` extra) and its routing tally
(``routing_tally``). ``generation`` and ``harness`` use ``probmoe.experiments`` (data,
checkpoints); ``probmoe.experiments`` never imports this package."""

from .gsm8k import MODES, extract_answer, gold_answer, is_correct

__all__ = ["MODES", "extract_answer", "gold_answer", "is_correct"]
