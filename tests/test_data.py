"""FlashRAG file IO: round trips, validation messages, streaming, append-only writing, the real datasets."""

from __future__ import annotations

import gzip
import json

import pytest
from conftest import SHARED_DATASETS, shared_dataset

from r3_env.data import (
    DataFormatError,
    JsonlWriter,
    Passage,
    QAItem,
    existing_ids,
    iter_corpus,
    iter_dataset,
    load_passages,
    parse_qa_row,
    read_dataset,
    read_label,
    write_corpus,
    write_dataset,
)

ITEMS = [
    QAItem("q1", "Who directed Silent Harbor?", ["Marta Kell"], {"type": "compositional"}),
    QAItem("q2", "Is it?", ["yes"], {}, extra={"choices": []}),
]


@pytest.mark.parametrize("name", ["train.jsonl", "train.jsonl.gz"])
def test_dataset_round_trip(tmp_path, name):
    path = tmp_path / name
    assert write_dataset(path, ITEMS) == 2
    assert read_dataset(path) == ITEMS
    if name.endswith(".gz"):
        assert json.loads(gzip.open(path, "rt").readline())["id"] == "q1"


def test_corpus_round_trip_and_title_text(tmp_path):
    passages = [Passage.from_title_text("1", "Silent Harbor", "A 1955 film."), Passage("2", "Only a title")]
    write_corpus(tmp_path / "corpus.jsonl", passages)
    back = list(iter_corpus(tmp_path / "corpus.jsonl"))
    assert back == passages
    assert (back[0].title, back[0].text) == ("Silent Harbor", "A 1955 film.")
    assert (back[1].title, back[1].text) == ("Only a title", "")


def test_wikipedia_quoted_titles_are_unquoted():
    assert Passage("1", '"Aaron"\nAaron is a prophet.').title == "Aaron"
    assert Passage("1", 'I Cannot Say "Farewell"\ntext').title == 'I Cannot Say "Farewell"'


def test_corpus_accepts_title_and_text_fields(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text(json.dumps({"id": 5, "title": "T", "text": "body"}) + "\n")
    assert list(iter_corpus(path)) == [Passage("5", "T\nbody")]


def _write_lines(path, *lines):
    path.write_text("\n".join(lines) + "\n")
    return path


GOOD = json.dumps({"id": "a", "question": "q?", "golden_answers": ["x"]})


@pytest.mark.parametrize(
    ("bad", "field", "fix"),
    [
        ('{"id": "b", "question": "q?", "golden_answers": ["x"]', None, "not valid JSON"),
        ('["a", "list"]', None, "expected a JSON object"),
        ('{"question": "q?", "golden_answers": ["x"]}', "id", "unique string id"),
        ('{"id": "b", "golden_answers": ["x"]}', "question", "give the question text"),
        ('{"id": "b", "question": "q?", "golden_answers": "x"}', "golden_answers", "wrap it in a list"),
        ('{"id": "b", "question": "q?", "golden_answers": []}', "golden_answers", "non-empty list"),
        ('{"id": "b", "question": "q?", "golden_answers": [["x"]]}', "golden_answers", "must hold strings"),
        ('{"id": "b", "question": "q?", "golden_answers": ["x"], "metadata": [1]}', "metadata", "must be an object"),
        ('{"id": true, "question": "q?", "golden_answers": ["x"]}', "id", "must be a string"),
    ],
)
def test_dataset_errors_name_file_line_field_and_fix(tmp_path, bad, field, fix):
    path = _write_lines(tmp_path / "dev.jsonl", GOOD, "", bad)
    with pytest.raises(DataFormatError) as caught:
        list(iter_dataset(path))
    error = caught.value
    assert (error.path, error.line, error.field) == (str(path), 3, field)
    assert str(error).startswith(f"{path}:3: ") and fix in str(error)
    if field:
        assert f"field '{field}'" in str(error)


def test_corpus_errors(tmp_path):
    path = _write_lines(tmp_path / "corpus.jsonl", '{"id": "1", "contents": "a\\nb"}', '{"id": "2", "contents": 7}')
    with pytest.raises(DataFormatError, match=r"corpus.jsonl:2: field 'contents'.*title\\ntext"):
        list(iter_corpus(path))


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl: no such file"):
        list(iter_dataset(tmp_path / "nope.jsonl"))


def test_duplicate_ids_are_reported_with_both_lines(tmp_path):
    path = _write_lines(tmp_path / "dev.jsonl", GOOD, GOOD)
    with pytest.raises(DataFormatError, match=r"dev.jsonl:2: field 'id': duplicate id 'a' \(first on line 1\)"):
        read_dataset(path)
    assert len(read_dataset(path, unique_ids=False)) == 2


def test_readers_stream(tmp_path):
    """Rows before a broken line are yielded before the break is read: nothing is loaded up front."""
    path = _write_lines(
        tmp_path / "corpus.jsonl", *[json.dumps({"id": str(i), "contents": f"t{i}\nx"}) for i in range(1000)], "{broken"
    )
    stream = iter_corpus(path)
    assert [next(stream).id for _ in range(3)] == ["0", "1", "2"]
    with pytest.raises(DataFormatError, match="corpus.jsonl:1001"):
        list(stream)


def test_load_passages_by_id(tmp_path):
    write_corpus(tmp_path / "c.jsonl", [Passage(str(i), f"t{i}\nx") for i in range(50)])
    found = load_passages(tmp_path / "c.jsonl", ["3", "40", "999"])
    assert sorted(found) == ["3", "40"]


def test_writer_appends_and_never_rewrites(tmp_path):
    path = tmp_path / "out" / "rows.jsonl"
    with JsonlWriter(path) as writer:
        writer.write({"id": "1"})
    with JsonlWriter(path) as writer:
        writer.write({"id": "2"})
        assert writer.written == 1
    assert [json.loads(line)["id"] for line in path.read_text().splitlines()] == ["1", "2"]


def test_writer_drops_an_incomplete_last_line_from_a_killed_run(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"id": "1"}\n{"id": "2"}\n{"id": "3", "answ')
    assert existing_ids(path) == {"1", "2"}
    with JsonlWriter(path) as writer:
        writer.write({"id": "3"})
    assert path.read_text() == '{"id": "1"}\n{"id": "2"}\n{"id": "3"}\n'


def test_writer_keeps_a_complete_last_row_missing_its_newline(tmp_path):
    """Resume reads the ids first; the last row without its newline counts, so it is neither lost nor repeated."""
    path = tmp_path / "rows.jsonl"
    path.write_text('{"id": "1"}\n{"id": "2"}')
    assert existing_ids(path) == {"1", "2"}
    with JsonlWriter(path) as writer:
        writer.write({"id": "3"})
    assert [json.loads(line)["id"] for line in path.read_text().splitlines()] == ["1", "2", "3"]


def test_writer_repairs_a_file_that_is_one_partial_line(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"id": "1", "x": ' + "9" * 3_000_000)
    with JsonlWriter(path) as writer:
        writer.write({"id": "1"})
    assert path.read_text() == '{"id": "1"}\n'


def test_append_only_outputs_refuse_gzip(tmp_path):
    with pytest.raises(ValueError, match="cannot be gzip files"):
        JsonlWriter(tmp_path / "rows.jsonl.gz")


def test_invalid_utf8_names_the_line(tmp_path):
    path = tmp_path / "dev.jsonl"
    path.write_bytes(GOOD.encode() + b"\n" + b'{"id": "\xff"}\n')
    with pytest.raises(DataFormatError, match=r"dev.jsonl:2: not UTF-8 text"):
        list(iter_dataset(path))


def test_parse_qa_row_keeps_unknown_keys():
    item = parse_qa_row({"id": 3, "question": "q", "golden_answers": [1921], "choices": ["a"]})
    assert item.id == "3" and item.golden_answers == ["1921"] and item.to_json()["choices"] == ["a"]


@pytest.mark.parametrize("name", SHARED_DATASETS)
def test_real_datasets_load_and_their_gold_passages_exist(name):
    folder = shared_dataset(name)
    items = read_dataset(folder / "dev.jsonl")
    assert len(items) > 100
    gold = {pid for item in items for pid in item.metadata["supporting_passage_ids"]}
    found = load_passages(folder / "corpus.jsonl", gold)
    assert set(found) == gold
    for item in items:  # titles parse out of 'contents' exactly as the dataset names them
        titles = {found[pid].title for pid in item.metadata["supporting_passage_ids"]}
        assert titles == set(item.metadata["supporting_titles"]), item.id
        assert all(found[pid].text for pid in item.metadata["supporting_passage_ids"])


@pytest.mark.parametrize(
    ("label", "answers", "question", "gold"),
    [
        ('["Paris", "paris"]', ["Paris", "paris"], None, []),
        ("Paris", ["Paris"], None, []),
        (["Paris", 1889], ["Paris", "1889"], None, []),
        ('{"golden_answers": ["Ann"], "question": "Who?", "gold_ids": ["3", 4]}', ["Ann"], "Who?", ["3", "4"]),
        ({"answers": "Ann", "metadata": {"supporting_passage_ids": ["7"]}}, ["Ann"], None, ["7"]),
        ({"type": "comparison", "supporting_passage_ids": ["1", "2"]}, [], None, ["1", "2"]),  # a row's metadata
        ("null", [], None, []),
        ("", [], None, []),
        ([None, True, " "], [], None, []),
    ],
)
def test_read_label_accepts_every_label_shape(label, answers, question, gold):
    read = read_label(label)
    assert (read.golden_answers, read.question, read.gold_ids) == (answers, question, gold)
