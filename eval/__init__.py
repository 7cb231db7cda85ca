"""eval: FlashRAG-compatible evaluation of step-by-step policies (EM, F1, judge ACC, retrieval metrics).

It may import ``r3_env`` (protocol, answers, data); its engines, metrics, baselines and reports
arrive with the evaluation issue.
"""
