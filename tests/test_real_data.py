"""The shared samples as one retrieval world (r3_env.real_data): one corpus with dataset-prefixed ids, and a
split by question id that is fixed, disjoint and complete, on the real files of ../shared/data."""

from __future__ import annotations

import json

import pytest
from conftest import SHARED_DATA, SHARED_DATASETS, shared_dataset

from r3_env.data import iter_corpus, read_dataset
from r3_env.real_data import prepare_real_data, split_part


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    for name in SHARED_DATASETS:
        shared_dataset(name)
    return prepare_real_data(SHARED_DATA, tmp_path_factory.mktemp("real") / "data")


def test_the_split_is_a_fixed_function_of_the_id_with_the_asked_share():
    ids = [f"q{i}" for i in range(4000)]
    parts = [split_part(i) for i in ids]
    assert parts == [split_part(i) for i in ids]  # no state, no order
    assert 0.47 < parts.count("eval") / len(ids) < 0.53
    assert 0.17 < [split_part(i, 0.2) for i in ids].count("eval") / len(ids) < 0.23
    # a smaller eval share keeps its questions inside the larger one's: growing the share only moves train to eval
    assert all(split_part(i, 0.5) == "eval" for i in ids if split_part(i, 0.2) == "eval")


def test_the_union_corpus_prefixes_every_id_with_its_dataset(prepared):
    ids = [passage.id for passage in iter_corpus(prepared.corpus)]
    sizes = {name: sum(1 for _ in iter_corpus(SHARED_DATA / name / "corpus.jsonl")) for name in SHARED_DATASETS}
    assert len(ids) == len(set(ids)) == sum(sizes.values())
    for name, size in sizes.items():
        assert sum(i.startswith(f"{name}/") for i in ids) == size


def test_every_question_lands_in_exactly_the_part_its_id_names(prepared):
    corpus = {passage.id for passage in iter_corpus(prepared.corpus)}
    for name in SHARED_DATASETS:
        source = {item.id: item for item in read_dataset(SHARED_DATA / name / "dev.jsonl")}
        train = read_dataset(prepared.root / name / "train.jsonl")
        evaluation = read_dataset(prepared.root / name / "eval.jsonl")
        assert {i.id for i in train} | {i.id for i in evaluation} == set(source)
        assert len(train) + len(evaluation) == len(source) and train and evaluation
        for part, items in (("train", train), ("eval", evaluation)):
            for item in items:
                assert split_part(item.id) == part
                original = source[item.id]
                assert (item.question, item.golden_answers) == (original.question, original.golden_answers)
                gold = item.metadata["supporting_passage_ids"]
                assert gold == [f"{name}/{pid}" for pid in original.metadata["supporting_passage_ids"]]
                assert set(gold) <= corpus and set(item.metadata["context_passage_ids"]) <= corpus


def test_ppo_prompts_are_every_train_question_with_the_datasets_interleaved(prepared):
    prompts = read_dataset(prepared.prompts)
    train = {name: read_dataset(prepared.root / name / "train.jsonl") for name in SHARED_DATASETS}
    assert sorted(i.id for i in prompts) == sorted(i.id for items in train.values() for i in items)
    first = [next(name for name, items in train.items() if item.id in {i.id for i in items}) for item in prompts[:3]]
    assert first == list(SHARED_DATASETS)
    assert prepared.data("eval").split(",") == [str(prepared.root / n / "eval.jsonl") for n in SHARED_DATASETS]


def test_a_rerun_does_nothing_and_other_settings_or_missing_files_are_refused(prepared, tmp_path):
    stamp = prepared.corpus.stat().st_mtime_ns
    again = prepare_real_data(SHARED_DATA, prepared.root)
    assert again == prepared and prepared.corpus.stat().st_mtime_ns == stamp
    record = json.loads((prepared.root / "real_data.json").read_text())
    assert record["questions"]["hotpotqa"]["train"] + record["questions"]["hotpotqa"]["eval"] == 400
    with pytest.raises(ValueError, match="other settings"):
        prepare_real_data(SHARED_DATA, prepared.root, eval_share=0.3)
    with pytest.raises(FileNotFoundError, match=r"nowhere/hotpotqa/dev\.jsonl.*one folder per dataset"):
        prepare_real_data(tmp_path / "nowhere", tmp_path / "out")
    with pytest.raises(ValueError, match="eval_share"):
        prepare_real_data(SHARED_DATA, tmp_path / "out", eval_share=1.0)
