"""The step protocol: parsing (every failure reason), rendering, round trips, chat-template prefix consistency."""

from __future__ import annotations

import pytest
from conftest import POSITIONAL_TEMPLATE, make_tokenizer
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from r3_env.data import Passage
from r3_env.protocol import (
    ChatRenderer,
    ChatTemplateError,
    FormatError,
    FormatReason,
    Step,
    Turn,
    available_formats,
    build_messages,
    extract_answer,
    get_format,
    parse_step,
    render_documents,
    render_prompt,
    render_step,
)
from r3_env.protocol.base import parse_document_blocks

R3 = get_format("r3")

# -- parsing ----------------------------------------------------------------------------------------

VALID = [
    (
        "The problem analysis: I need the director.\nThe retrieval query: Who directed Silent Harbor?",
        Step("I need the director.", query="Who directed Silent Harbor?"),
    ),
    (
        "The problem analysis: Marta Kell directed it.\nThe final answer: Marta Kell",
        Step("Marta Kell directed it.", answer="Marta Kell"),
    ),
    # cosmetics real models add
    ("Step 2:\nThe problem analysis: a\nThe final answer: b", Step("a", answer="b")),
    ("**The problem analysis:** a\n**The retrieval query:** b?", Step("a", query="b?")),
    ("**The problem analysis**: a\n**The final answer**: b", Step("a", answer="b")),
    ("## The Problem Analysis: a\nthe FINAL answer: b", Step("a", answer="b")),
    (
        "The problem analysis:\nfirst line\n\nsecond line\nThe retrieval query:\n  who is b?  \n\n",
        Step("first line\n\nsecond line", query="who is b?"),
    ),
    ("  The problem analysis: a  \r\nThe final answer: yes\r\n", Step("a", answer="yes")),
    # one question that contains a question mark in a title
    (
        "The problem analysis: a\nThe retrieval query: Who directed Who Framed Roger Rabbit?",
        Step("a", query="Who directed Who Framed Roger Rabbit?"),
    ),
    (
        'The problem analysis: a\nThe retrieval query: Is "Who Am I?" directed by Marta Kell?',
        Step("a", query='Is "Who Am I?" directed by Marta Kell?'),
    ),
    # whole-line bold, and "Step k:" on the same line as the first label
    ("**The problem analysis: a**\n**The final answer: Paris**", Step("a", answer="Paris")),
    ("Step 1: The problem analysis: a\nThe retrieval query: b?", Step("a", query="b?")),
    # a reasoning model's think block (Qwen3) is not part of the step
    ("<think>\nWho is b?\n</think>\n\nThe problem analysis: a\nThe retrieval query: b?", Step("a", query="b?")),
]

INVALID = [
    ("", FormatReason.EMPTY),
    ("   \n\t ", FormatReason.EMPTY),
    ("I think the answer is Paris.", FormatReason.MISSING_ANALYSIS),
    ("The retrieval query: who?", FormatReason.MISSING_ANALYSIS),
    ("The final answer: b\nThe problem analysis: a", FormatReason.ACTION_BEFORE_ANALYSIS),
    ("Sure! Here is my step.\nThe problem analysis: a\nThe final answer: b", FormatReason.TEXT_BEFORE_ANALYSIS),
    ("Step 1:\nOkay.\nThe problem analysis: a\nThe final answer: b", FormatReason.TEXT_BEFORE_ANALYSIS),
    ("The problem analysis: a\nThe problem analysis: a again\nThe final answer: b", FormatReason.DUPLICATE_ANALYSIS),
    ("The problem analysis:   \nThe final answer: b", FormatReason.EMPTY_ANALYSIS),
    ("The problem analysis: I will think more.", FormatReason.MISSING_ACTION),
    ("The problem analysis: a\nThe retrieval query: q?\nThe final answer: b", FormatReason.BOTH_QUERY_AND_ANSWER),
    ("The problem analysis: a\nThe final answer: b\nThe retrieval query: q?", FormatReason.BOTH_QUERY_AND_ANSWER),
    ("The problem analysis: a\nThe retrieval query: q1?\nThe retrieval query: q2?", FormatReason.MULTIPLE_QUERIES),
    (
        "The problem analysis: a\nThe retrieval query: Who is Anna Berg? Where was she born?",
        FormatReason.MULTIPLE_QUERIES,
    ),
    ("The problem analysis: a\nThe retrieval query:   ", FormatReason.EMPTY_QUERY),
    (
        "The problem analysis: a\nThe retrieval query: who is b?\nThe retrieval documents: [1] b",
        FormatReason.TEXT_AFTER_QUERY,
    ),
    ("The problem analysis: a\nThe retrieval query: who is b?\nStep 2:", FormatReason.TEXT_AFTER_QUERY),
    ("The problem analysis: a\nThe final answer: b\nThe final answer: c", FormatReason.MULTIPLE_ANSWERS),
    ("The problem analysis: a\nThe final answer:", FormatReason.EMPTY_ANSWER),
    ("The problem analysis: a\nThe final answer: Paris\nI hope this helps!", FormatReason.TEXT_AFTER_ANSWER),
    ("<think>\nThe budget ran out while thinking", FormatReason.UNCLOSED_TAG),
]

TAGS = get_format("tags")

TAGS_VALID = [
    (
        "<think>I need the director.</think>\n<search>Silent Harbor director</search>",
        Step("I need the director.", query="Silent Harbor director"),
    ),
    (
        "<reflect>It names Marta Kell.</reflect>\n<think>Now her birthplace.</think>\n"
        "<search>Marta Kell birthplace</search>",
        Step("Now her birthplace.", query="Marta Kell birthplace", reflection="It names Marta Kell."),
    ),
    ("<reflect>Born in Oslo.</reflect>\n<answer>Oslo</answer>", Step("", answer="Oslo", reflection="Born in Oslo.")),
    (
        "<think>\nParis is the capital.\n</think>\n\n<reflect>I am sure.</reflect><answer> Paris </answer>\n",
        Step("Paris is the capital.", answer="Paris", reflection="I am sure."),
    ),
    ("  <think>a</think>\r\n<answer>b</answer>", Step("a", answer="b")),
]

TAGS_INVALID = [
    ("", FormatReason.EMPTY),
    ("The answer is Paris.", FormatReason.TEXT_BEFORE_ANALYSIS),
    ("Sure.\n<think>a</think><search>q</search>", FormatReason.TEXT_BEFORE_ANALYSIS),
    ("<think>a</think>\n<search>q", FormatReason.UNCLOSED_TAG),
    ("<think>a", FormatReason.UNCLOSED_TAG),
    ("<think>a</think> hmm <search>q</search>", FormatReason.STRAY_TEXT),
    ("<think>a <search>q</search></think>", FormatReason.STRAY_TEXT),
    ("<think>a</think><search>q</search><information>made up</information>", FormatReason.STRAY_TEXT),
    ("<search>q</search>", FormatReason.MISSING_ANALYSIS),
    ("<reflect>r</reflect><search>q</search>", FormatReason.MISSING_ANALYSIS),
    ("<answer>b</answer>", FormatReason.MISSING_ANALYSIS),
    ("<think>a</think>", FormatReason.MISSING_ACTION),
    ("<think>a</think><think>b</think><search>q</search>", FormatReason.DUPLICATE_ANALYSIS),
    ("<think> </think><search>q</search>", FormatReason.EMPTY_ANALYSIS),
    ("<think>a</think><search> </search>", FormatReason.EMPTY_QUERY),
    ("<think>a</think><reflect>r</reflect><answer></answer>", FormatReason.EMPTY_ANSWER),
    ("<think>a</think><search>q</search><answer>b</answer>", FormatReason.BOTH_QUERY_AND_ANSWER),
    ("<think>a</think><search>q</search><search>p</search>", FormatReason.MULTIPLE_QUERIES),
    ("<think>a</think><reflect>r</reflect><answer>b</answer><answer>c</answer>", FormatReason.MULTIPLE_ANSWERS),
    ("<think>a</think><search>q</search>\nThe documents say", FormatReason.TEXT_AFTER_QUERY),
    ("<think>a</think><search>q</search><think>b</think>", FormatReason.TEXT_AFTER_QUERY),
    ("<reflect>r</reflect><answer>b</answer> I hope this helps!", FormatReason.TEXT_AFTER_ANSWER),
    ("<think>a</think><reflect>r</reflect><search>q</search>", FormatReason.MISPLACED_REFLECTION),
    ("<reflect>r</reflect><think>a</think><answer>b</answer>", FormatReason.MISPLACED_REFLECTION),
]

# (step, after documents, the reason check_turn gives, or None): the two shapes of
# docs/recipes/lws.md#rollout-format
TAGS_TURNS = [
    (Step("a", query="q"), False, None),
    (Step("a", query="q", reflection="r"), True, None),
    (Step("a", answer="b", reflection="r"), False, None),  # think, reflect, answer: no retrieval
    (Step("", answer="b", reflection="r"), True, None),  # ..., information, reflect, answer
    (Step("a", query="q"), True, FormatReason.MISSING_REFLECTION),
    (Step("a", answer="b"), False, FormatReason.MISSING_REFLECTION),
    (Step("a", query="q", reflection="r"), False, FormatReason.MISPLACED_REFLECTION),
    (Step("a", answer="b", reflection="r"), True, FormatReason.MISPLACED_REFLECTION),
    (Step("", answer="b", reflection="r"), False, FormatReason.MISSING_ANALYSIS),
]


@pytest.mark.parametrize(("text", "expected"), VALID)
def test_parse_valid(text, expected):
    assert parse_step(text) == expected


@pytest.mark.parametrize(("text", "reason"), INVALID)
def test_parse_invalid_reason(text, reason):
    with pytest.raises(FormatError) as caught:
        parse_step(text)
    assert caught.value.reason is reason
    assert caught.value.reason.value in str(caught.value)


R3 = get_format("r3")

A = "The problem analysis: a\n"
# (what stays when the step ends with its first query or answer line, what the model wrote after it)
ACTION_ENDS = [
    (A + "The retrieval query: q", "\nThe final answer: q"),
    (A + "The final answer: b", "\nThe retrieval query: q?"),
    (A + "The final answer: Paris", "\nI hope this helps!"),
    (A + "b\nThe retrieval query: q1", "\nThe retrieval query: q2"),
    (A + "The retrieval query:\n\n  q  ", "\nmore"),  # the query on the line after its label
    ("<think>\nThe final answer: x\n</think>\n" + A + "The final answer: b", "\nc"),
    ("The problem analysis: a\r\nThe retrieval query: q\r", "\nThe final answer: b"),
]
# outputs where nothing is cut
WHOLE = [
    A + "The retrieval query: q\n\n",  # nothing follows
    A + "The retrieval query: q",
    "The final answer: b\nThe problem analysis: a",  # an action before the analysis: the parser's to refuse
    A + "The retrieval query:\nThe final answer: b",  # an empty query, then a label
    "The problem analysis: I will think more.\nStill thinking",
    "<think>\nnever closes\nThe final answer: b\nc",
]


@pytest.mark.parametrize(("kept", "after"), ACTION_ENDS)
def test_a_step_ends_with_its_first_query_or_answer_line(kept, after):
    assert R3.action_end(kept + after) == len(kept)
    R3.parse_step(kept)  # what is kept parses as a step
    assert get_format("tags").action_end(kept + after) is None  # formats that stop at a stop string keep the default


@pytest.mark.parametrize("text", WHOLE)
def test_a_step_with_nothing_after_its_action_or_no_clear_action_is_not_cut(text):
    assert R3.action_end(text) is None


@pytest.mark.parametrize(("text", "expected"), TAGS_VALID)
def test_tags_parse_valid(text, expected):
    assert TAGS.parse_step(text) == expected


@pytest.mark.parametrize(("text", "reason"), TAGS_INVALID)
def test_tags_parse_invalid_reason(text, reason):
    with pytest.raises(FormatError) as caught:
        TAGS.parse_step(text)
    assert caught.value.reason is reason


@pytest.mark.parametrize(("step", "after_documents", "reason"), TAGS_TURNS)
def test_tags_check_turn_allows_exactly_the_two_shapes(step, after_documents, reason):
    if reason is None:
        TAGS.check_turn(step, after_documents)
        return
    with pytest.raises(FormatError) as caught:
        TAGS.check_turn(step, after_documents)
    assert caught.value.reason is reason


def test_every_reason_is_reachable():
    # TRUNCATED is the environment's verdict on a step cut off by its token limit (tests/test_rollout.py)
    reached = {reason for _, reason in INVALID + TAGS_INVALID} | {reason for *_, reason in TAGS_TURNS if reason}
    assert reached == set(FormatReason) - {FormatReason.TRUNCATED}


def test_formats_without_a_reflection_fold_it_into_the_analysis():
    step = Step("Next her birthplace.", query="Marta Kell birthplace", reflection="It names Marta Kell.")
    for name in ("r3", "react"):
        fmt = get_format(name)
        with pytest.raises(ValueError, match="no reflection"):
            fmt.render_step(step)
        assert fmt.express(step) == Step("It names Marta Kell. Next her birthplace.", query="Marta Kell birthplace")
        fmt.check_turn(fmt.express(step), after_documents=True)  # one shape at every position
    assert TAGS.express(step) is step


def test_parse_non_text_is_a_format_error():
    with pytest.raises(FormatError):
        parse_step(None)  # type: ignore[arg-type]


# -- steps and rendering ----------------------------------------------------------------------------


def test_step_needs_exactly_one_action():
    with pytest.raises(ValueError):
        Step("a")
    with pytest.raises(ValueError):
        Step("a", query="q", answer="b")
    assert Step("  a\r\nb ", answer=" c ") == Step("a\nb", answer="c")
    assert Step("a", answer="b").is_final and not Step("a", query="q").is_final


def test_render_step_layout():
    assert render_step(Step("a", query="q?")) == "The problem analysis: a\nThe retrieval query: q?"
    assert render_step(Step("a\nb", answer="c")) == "The problem analysis: a\nb\nThe final answer: c"


@pytest.mark.parametrize(
    "step",
    [
        Step("a", query="line one\nline two"),
        Step("a", answer="two\nlines"),
        Step("fine\nThe final answer: sneaky", answer="b"),
        Step("a", query="Who is Anna Berg? Where was she born?"),
    ],
)
def test_render_rejects_what_would_not_parse_back(step):
    with pytest.raises(ValueError):
        render_step(step)


def test_format_registry():
    assert {"r3", "tags", "react"} <= set(available_formats())
    assert get_format(R3) is R3
    with pytest.raises(ValueError, match="unknown step format 'nope'.*r3"):
        get_format("nope")


def test_extract_answer_from_final_steps_and_free_text():
    assert extract_answer("The problem analysis: a\nThe final answer: **Marta Kell**.") == "Marta Kell"
    assert extract_answer("The problem analysis: a\nThe retrieval query: who?") is None
    assert extract_answer("rambling\nThe final answer: The answer is 1921.\nmore rambling") == "1921"
    assert extract_answer("no answer at all") is None


def test_find_answer_is_lenient():
    assert R3.find_answer("blah\n**The final answer:** Paris\n") == "Paris"
    assert R3.find_answer("blah\r**The final answer: Paris**\r") == "Paris"
    assert R3.find_answer("The final answer:\n\nBerlin") == "Berlin"
    assert R3.find_answer("The final answer:\nThe problem analysis: x") is None
    assert R3.find_answer("no label here") is None


# -- documents ---------------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.text(max_size=20), st.text(max_size=80)), max_size=4), st.integers(1, 40))
def test_rendered_documents_have_no_surrounding_whitespace(docs, doc_chars):
    """Templates that trim message content (Llama 3's) must leave every rendered piece unchanged."""
    passages = [Passage.from_title_text(str(i), title, text) for i, (title, text) in enumerate(docs)]
    block = render_documents(passages, 1, doc_chars)
    assert block == block.strip()


def test_document_block_numbers_titles_and_truncates():
    docs = [
        Passage.from_title_text("7", "Silent Harbor", "A film.  Directed   by Marta Kell."),
        Passage.from_title_text("9", "Long", "word " * 400),
    ]
    block = render_documents(docs, step_number=2, doc_chars=60)
    lines = block.split("\n")
    assert lines[0] == "Retrieved documents for step 2:"
    assert lines[1:3] == ["[1] Silent Harbor", "A film. Directed by Marta Kell."]
    assert lines[4] == "[2] Long"
    assert len(lines[5]) <= 64 and lines[5].endswith(" ...")
    assert "no documents" in render_documents([], step_number=1)


# -- property tests ------------------------------------------------------------------------------------

LABEL_SOUP = st.sampled_from(
    [
        "<think>",
        "</think>",
        "<search>",
        "</search>",
        "<reflect>",
        "</reflect>",
        "<answer>",
        "</answer>",
        "<information>",
        "The problem analysis:",
        "The retrieval query:",
        "The final answer:",
        "**",
        "Step 3:",
        "\n",
        "?",
        " ",
        "##",
        ":",
        "the final ANSWER:",
        "\r\n",
        "\t",
    ]
)
text_pieces = st.lists(st.one_of(LABEL_SOUP, st.text(max_size=15)), max_size=12).map("".join)


PROPERTY_FORMATS = ["r3", "tags"]


@settings(max_examples=400, deadline=None)
@given(text=st.one_of(st.text(), text_pieces))
def test_a_steps_end_is_inside_the_text_with_text_after_it(text):
    end = R3.action_end(text)
    assert end is None or (0 < end < len(text) and text[end:].strip())


@pytest.mark.parametrize("name", PROPERTY_FORMATS)
@settings(max_examples=400, deadline=None)
@given(text=st.one_of(st.text(), text_pieces))
def test_parse_raises_only_format_error(name, text):
    try:
        step = get_format(name).parse_step(text)
    except FormatError as error:
        assert isinstance(error.reason, FormatReason)
    else:
        assert (step.analysis or step.reflection) and (step.query or step.answer)


line = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\n\r"), min_size=1, max_size=40)
paragraph = st.lists(st.one_of(line, text_pieces), min_size=1, max_size=4).map("\n".join)
steps = st.builds(
    lambda analysis, action, final, reflection: (
        Step(analysis, answer=action, reflection=reflection)
        if final
        else Step(analysis, query=action, reflection=reflection)
    ),
    paragraph,
    st.one_of(line, text_pieces),
    st.booleans(),
    st.one_of(st.none(), paragraph),
)


@pytest.mark.parametrize("name", PROPERTY_FORMATS)
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(data=st.data())
def test_render_then_parse_round_trips(name, data):
    fmt = get_format(name)
    try:
        step = fmt.express(data.draw(steps))
        rendered = fmt.render_step(step)
    except ValueError:
        assume(False)
        return
    assert fmt.parse_step(rendered) == step


# -- chat transcripts -----------------------------------------------------------------------------------

QUESTION = "Who directed Silent Harbor?"
DOCS = [
    Passage.from_title_text("1", "Silent Harbor", "Silent Harbor is a 1955 film directed by Marta Kell."),
    Passage.from_title_text("2", "Marta Kell", "Marta Kell (born 1921) is a Valdorian film director."),
    Passage("3", "Only a title"),
]
TURNS = [
    Turn(Step("I need the director of the film.", query="Who directed Silent Harbor?"), DOCS),
    Turn(Step("Check the second film too.", query="Marta Kell filmography"), ()),
    Turn(Step("Marta Kell directed it.", answer="Marta Kell")),
]
TURNS_BY_FORMAT = {
    "r3": TURNS,
    "tags": [
        Turn(Step("I need the director of the film.", query="Silent Harbor director"), DOCS),
        Turn(Step("Check her films.", query="Marta Kell filmography", reflection="Marta Kell directed it."), ()),
        Turn(Step("", answer="Marta Kell", reflection="Nothing more; the first documents suffice.")),
    ],
}


def test_renderer_matches_apply_chat_template(chat_tokenizers):
    for name, tokenizer, template in chat_tokenizers:
        renderer = ChatRenderer(tokenizer, chat_template=template)
        for k in range(len(TURNS) + 1):
            messages = renderer.messages(QUESTION, TURNS[:k])
            generation = k < len(TURNS)  # after a query the transcript ends with a generation prompt
            expected = tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=generation, chat_template=renderer.template
            )
            transcript = renderer.transcript(QUESTION, TURNS[:k])
            if generation:
                assert transcript == expected, name
            elif not renderer.frame.rewrites_last_turn:
                # a finished transcript ends at the stop token; templates may add a newline after it
                assert expected.startswith(transcript) and transcript.endswith(renderer.frame.turn_end), name
                assert len(expected) - len(transcript) <= 2, name
            else:  # the template re-renders the last assistant turn (a think block): all before it agrees
                before_last = renderer.transcript(QUESTION, TURNS[: k - 1])
                assert expected.startswith(before_last[: before_last.rindex(renderer.frame.observation_close)])
                assert expected.rstrip().endswith(renderer.step(TURNS[k - 1].step)), name
    rewriting = {
        name
        for name, tok, template in chat_tokenizers
        if ChatRenderer(tok, chat_template=template).frame.rewrites_last_turn
    }
    assert rewriting == {"qwen3-style"}


@pytest.mark.parametrize("format_name", PROPERTY_FORMATS)
def test_transcript_is_prefix_consistent_in_tokens(chat_tokenizers, format_name):
    turns = TURNS_BY_FORMAT[format_name]
    for name, tokenizer, template in chat_tokenizers:
        renderer = ChatRenderer(tokenizer, format_name, chat_template=template)
        previous: list[int] = []
        for k in range(len(turns) + 1):
            ids = tokenizer(renderer.transcript(QUESTION, turns[:k]), add_special_tokens=False)["input_ids"]
            assert ids[: len(previous)] == previous, f"{name}: steps 1..{k - 1} are not a token prefix of 1..{k}"
            previous = ids
        renderer.check_tokenization(QUESTION, turns)


@pytest.mark.parametrize("format_name", PROPERTY_FORMATS)
def test_rollout_token_assembly_equals_whole_transcript(chat_tokenizers, format_name):
    """What OpenRLHF's multi-turn executor builds (prompt, then action tokens, then feedback) equals SFT's tokens."""
    turns = TURNS_BY_FORMAT[format_name]
    for name, tokenizer, template in chat_tokenizers:
        renderer = ChatRenderer(tokenizer, format_name, chat_template=template)
        ids = lambda text, tok=tokenizer: tok(text, add_special_tokens=False)["input_ids"]
        tokens = ids(renderer.prompt(QUESTION))
        for number, turn in enumerate(turns, start=1):
            action = ids(renderer.format.render_step(turn.step)) + renderer.stop_token_ids
            tokens += action
            if not turn.step.is_final:
                tokens += ids(renderer.observation(turn.documents, number))
        assert tokens == ids(renderer.transcript(QUESTION, turns)), name


def test_the_stop_token_ends_each_step(chat_tokenizers):
    for name, tokenizer, template in chat_tokenizers:
        renderer = ChatRenderer(tokenizer, chat_template=template)
        assert tokenizer.convert_ids_to_tokens(renderer.stop_token_ids) == [renderer.frame.turn_end], name
        assert renderer.step(TURNS[0].step).endswith(renderer.frame.turn_end)
        unclosed = renderer.observation(DOCS, 1, action_closed=False)
        assert unclosed == renderer.frame.turn_end + renderer.observation(DOCS, 1)


step_lists = st.lists(steps, min_size=1, max_size=4)


@pytest.mark.parametrize("format_name", PROPERTY_FORMATS)
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_prefix_consistency_property(chat_tokenizers, format_name, data):
    """For generated trajectories, tokens of steps 1..k prefix those of 1..k+1 on every tokenizer."""
    fmt = get_format(format_name)
    drawn = [fmt.express(step) for step in data.draw(step_lists)]
    turns = [
        Turn(Step(s.analysis or "a", query=s.query or "q", reflection=s.reflection) if i < len(drawn) - 1 else s)
        for i, s in enumerate(drawn)
    ]
    try:
        for turn in turns:
            fmt.render_step(turn.step)
    except ValueError:
        assume(False)
        return
    turns = [Turn(turn.step, DOCS[: i % 3]) for i, turn in enumerate(turns)]
    for name, tokenizer, template in chat_tokenizers:
        renderer = ChatRenderer(tokenizer, fmt, chat_template=template)
        previous: list[int] = []
        for k in range(len(turns) + 1):
            ids = tokenizer(renderer.transcript(QUESTION, turns[:k]), add_special_tokens=False)["input_ids"]
            assert ids[: len(previous)] == previous, name
            previous = ids


@pytest.mark.parametrize("template_name", ["no-system-role", "drops-system"])
def test_templates_without_a_system_role_fold_instructions_into_the_question(chat_tokenizers, template_name):
    _, tokenizer, _ = next(t for t in chat_tokenizers if t[0] == template_name)
    renderer = ChatRenderer(tokenizer)
    assert renderer.frame.system_in_user
    messages = renderer.messages(QUESTION)
    assert [m["role"] for m in messages] == ["user"]
    assert messages[0]["content"].startswith(R3.system_prompt()) and messages[0]["content"].endswith(QUESTION)


def test_position_dependent_template_is_rejected(bpe_backend):
    with pytest.raises(ChatTemplateError, match="differently depending on its position"):
        ChatRenderer(make_tokenizer(bpe_backend, POSITIONAL_TEMPLATE))


def test_plain_template_needs_an_eos_token(bpe_backend):
    tokenizer = make_tokenizer(bpe_backend, None)
    tokenizer.eos_token = None
    with pytest.raises(ChatTemplateError, match="EOS"):
        ChatRenderer(tokenizer)


def test_piecewise_tokenization_check_catches_a_merging_tokenizer(bpe_backend):
    """A template that glues the step to the generation prompt with a space lets BPE merge across pieces."""
    template = (
        "{% for message in messages %}{{ '<|im_start|>' + message['role'] + ': ' + message['content'] + "
        "'<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant: ' }}{% endif %}"
    )
    renderer = ChatRenderer(make_tokenizer(bpe_backend, template))
    with pytest.raises(ChatTemplateError, match="piece by piece"):
        renderer.check_tokenization(QUESTION, TURNS)


def test_module_level_helpers(chat_tokenizers):
    _, tokenizer, _ = chat_tokenizers[0]
    prompt = render_prompt(QUESTION, tokenizer)
    assert prompt.endswith("<|im_start|>assistant\n") and QUESTION in prompt
    messages = build_messages(QUESTION, TURNS)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant", "user", "assistant"]
    assert messages[3]["content"].startswith("Retrieved documents for step 1:")
    assert messages[5]["content"] == "Retrieved documents for step 2:\n(no documents were found)"


def test_split_response_inverts_the_transcript(chat_tokenizers):
    """What follows the prompt splits back into each step and its document turn, on every template."""
    for name, tokenizer, template in chat_tokenizers:
        renderer = ChatRenderer(tokenizer, chat_template=template)
        prompt = renderer.prompt(QUESTION)
        full = renderer.transcript(QUESTION, TURNS)
        turns = renderer.split_response(full[len(prompt) :])
        assert [parse_step(t.action) for t in turns] == [t.step for t in TURNS], name
        assert [t.observation for t in turns] == [
            R3.render_documents(t.documents, n, 512) for n, t in enumerate(TURNS[:-1], start=1)
        ] + [None], name
        assert all(t.closed for t in turns)
        # a truncated generation: the last action has no stop token
        cut = renderer.transcript(QUESTION, TURNS[:1]) + "The problem analysis: half a st"
        last = renderer.split_response(cut[len(prompt) :])[-1]
        assert (last.action, last.observation, last.closed) == ("The problem analysis: half a st", None, False)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.text(max_size=20), st.text(max_size=60)), max_size=5))
def test_parse_documents_inverts_render_documents(docs):
    passages = [Passage.from_title_text(str(i), title, text) for i, (title, text) in enumerate(docs)]
    parsed = R3.parse_documents(R3.render_documents(passages, 3, doc_chars=10_000))
    assert [p.title for p in parsed] == [" ".join(p.title.split()) or "(untitled)" for p in passages]
    assert [p.text for p in parsed] == [" ".join(p.text.split()) for p in passages]
    assert [p.id for p in parsed] == [str(i) for i in range(1, len(passages) + 1)]


def test_the_question_reads_back_from_a_rendered_prompt(chat_tokenizers):
    for name, tokenizer, template in chat_tokenizers:
        renderer = ChatRenderer(tokenizer, chat_template=template)
        assert (
            renderer.question_of(renderer.prompt("Who directed  Silent\nHarbor?")) == "Who directed Silent Harbor?"
        ), name
    assert R3.find_question("no question here") is None


# -- the ReAct format (the ReAct baseline's steps) ----------------------------------------------------


def test_react_format_round_trips_and_reads_react_style_outputs():
    react = get_format("react")
    for step in (Step("I need the director", query="director of Kiss and Tell"), Step("done", answer="Paris")):
        assert react.parse_step(react.render_step(step)) == step
    assert react.parse_step("Thought 2: look again\nAction 2: search[ Corliss Archer ]") == Step(
        "look again", query="Corliss Archer"
    )
    assert react.parse_step("thought: multi\nline\nAction: Finish[yes]") == Step("multi\nline", answer="yes")
    cases = {
        "Action: Search[x]": FormatReason.MISSING_ANALYSIS,
        "Thought: a\nThought: b\nAction: Finish[x]": FormatReason.DUPLICATE_ANALYSIS,
        "Thought: a": FormatReason.MISSING_ACTION,
        "Thought: a\nAction: Lookup[x]": FormatReason.MISSING_ACTION,
        "Thought: a\nAction: Search[]": FormatReason.EMPTY_QUERY,
        "Thought: a\nAction: Search[x]\nObservation: made up": FormatReason.TEXT_AFTER_QUERY,
        "Thought: a\nAction: Search[x]\nAction: Finish[y]": FormatReason.MULTIPLE_QUERIES,
        "Thought: a\nAction: Search[a [b] c]": FormatReason.MISSING_ACTION,  # what render could not write back
    }
    for text, reason in cases.items():
        with pytest.raises(FormatError) as caught:
            react.parse_step(text)
        assert caught.value.reason is reason, text
    documents = [Passage.from_title_text("7", "Paris", "Capital of France.")]
    shown = react.render_documents(documents, 1, 512)
    assert shown.startswith("Observation:\n[1] Paris") and react.parse_documents(shown)[0].text == "Capital of France."
    assert react.find_question(react.render_question("Who  is\nthere?")) == "Who is there?"
    assert react.find_answer("...\nAction: Finish[Marie Curie]") == "Marie Curie"
    assert "Finish[" in react.answer_only_prompt(with_documents=True)
    assert react.stop_strings() == ("\nObservation:",) and get_format("r3").stop_strings() == ()


# -- the multi_query format (R2AG's expansion step) ----------------------------------------------------

MQ = get_format("multi_query")
MQ_TAGS = (
    "<think>",
    "</think>",
    "<base-query>",
    "</base-query>",
    "<predicted-query>",
    "</predicted-query>",
    "<stop-retrieval>",
)
# every reason multi_query's parse_step can give (the rest belong to answers, reflections and the environment)
MQ_REASONS = {
    FormatReason.EMPTY,
    FormatReason.MISSING_ANALYSIS,
    FormatReason.TEXT_BEFORE_ANALYSIS,
    FormatReason.ACTION_BEFORE_ANALYSIS,
    FormatReason.DUPLICATE_ANALYSIS,
    FormatReason.EMPTY_ANALYSIS,
    FormatReason.EMPTY_QUERY,
    FormatReason.MULTIPLE_QUERIES,
    FormatReason.MISSING_ACTION,
    FormatReason.STRAY_TEXT,
    FormatReason.TEXT_AFTER_QUERY,
    FormatReason.UNCLOSED_TAG,
}


def mq_text(analysis: str, base=(), predicted=(), stop: bool = False, sep: str = "\n") -> str:
    """A multi_query step written by hand (not by render_step), so over-limit steps can be written too."""
    blocks = [f"<think>{analysis}</think>"]
    blocks += [f"<base-query>{q}</base-query>" for q in base]
    blocks += [f"<predicted-query>{q}</predicted-query>" for q in predicted]
    return sep.join(blocks + (["<stop-retrieval>"] if stop else []))


MQ_VALID = [
    (
        "<think>I need the director.</think>\n<base-query>Silent Harbor director</base-query>",
        Step("I need the director.", queries=("Silent Harbor director",)),
    ),
    (
        mq_text("Two facts.", ["Silent Harbor director", "Kiss and Tell director"], ["Marta Kell birthplace"]),
        Step(
            "Two facts.",
            queries=("Silent Harbor director", "Kiss and Tell director"),
            predicted=("Marta Kell birthplace",),
        ),
    ),
    (
        mq_text("Last fact.", ["Marta Kell birthplace"], stop=True),
        Step("Last fact.", queries=("Marta Kell birthplace",), stop=True),
    ),
    ("<think>All found.</think>\n<stop-retrieval>", Step("All found.", stop=True)),
    # surrounding whitespace, Windows line ends, blocks glued together, multi-line blocks
    (
        "  <think>\n a \r\n b </think>\r\n<base-query>  q1 </base-query><base-query>q2</base-query>"
        "\n\n<stop-retrieval>\n",
        Step("a \n b", queries=("q1", "q2"), stop=True),
    ),
    (mq_text("a", ["q"] * 4, ["p"] * 2), Step("a", queries=("q",) * 4, predicted=("p",) * 2)),  # at the limits
    # angle brackets that are no tags are text
    (mq_text("x < y > z", ["a<b", "</c>"]), Step("x < y > z", queries=("a<b", "</c>"))),
]

MQ_INVALID = [
    ("", FormatReason.EMPTY),
    (" \n\t", FormatReason.EMPTY),
    ("<base-query>q</base-query>", FormatReason.MISSING_ANALYSIS),  # no think block at all
    ("<stop-retrieval>", FormatReason.MISSING_ANALYSIS),
    ("<base-query>q</base-query>\n<think>a</think>", FormatReason.ACTION_BEFORE_ANALYSIS),  # think not first
    ("<stop-retrieval><think>a</think>", FormatReason.ACTION_BEFORE_ANALYSIS),
    ("Sure!\n<think>a</think><base-query>q</base-query>", FormatReason.TEXT_BEFORE_ANALYSIS),
    ("I would search for the director.", FormatReason.TEXT_BEFORE_ANALYSIS),
    ("<think>a</think><think>b</think><base-query>q</base-query>", FormatReason.DUPLICATE_ANALYSIS),
    ("<think>a</think><base-query>q</base-query><think>b</think>", FormatReason.DUPLICATE_ANALYSIS),
    ("<think>  </think><base-query>q</base-query>", FormatReason.EMPTY_ANALYSIS),
    ("<think>a</think><base-query> \n </base-query>", FormatReason.EMPTY_QUERY),
    ("<think>a</think><base-query>q</base-query><predicted-query></predicted-query>", FormatReason.EMPTY_QUERY),
    (mq_text("a", ["q"] * 5), FormatReason.MULTIPLE_QUERIES),  # more base queries than max_base (4)
    (mq_text("a", ["q"], ["p"] * 3), FormatReason.MULTIPLE_QUERIES),  # more predicted than max_predicted (2)
    ("<think>a</think><predicted-query>p</predicted-query>", FormatReason.MISSING_ACTION),  # no base query
    ("<think>a</think>", FormatReason.MISSING_ACTION),  # neither a query nor the stop signal
    (
        "<think>a</think><base-query>q</base-query><predicted-query>p</predicted-query><base-query>r</base-query>",
        FormatReason.STRAY_TEXT,  # a base query after a predicted one
    ),
    ("<think>a <base-query>q</base-query></think><stop-retrieval>", FormatReason.STRAY_TEXT),  # a tag inside a block
    ("<think>a</think><base-query>q <stop-retrieval></base-query>", FormatReason.STRAY_TEXT),
    ("<think>a</think> so: <base-query>q</base-query>", FormatReason.STRAY_TEXT),  # text between blocks
    ("<think>a</think></base-query>", FormatReason.STRAY_TEXT),
    ("<think>a</think><stop-retrieval>\nThanks!", FormatReason.TEXT_AFTER_QUERY),  # text after stop
    ("<think>a</think><stop-retrieval><base-query>q</base-query>", FormatReason.TEXT_AFTER_QUERY),
    ("<think>a</think><base-query>q</base-query><stop-retrieval><stop-retrieval>", FormatReason.TEXT_AFTER_QUERY),
    ("<think>a</think><base-query>q</base-query>\n<information>made up</information>", FormatReason.TEXT_AFTER_QUERY),
    ("<think>a</think><base-query>q", FormatReason.UNCLOSED_TAG),
    ("<think>a</think><base-query>q</base-query><predicted-query>p", FormatReason.UNCLOSED_TAG),
    ("<think>the budget ran out", FormatReason.UNCLOSED_TAG),
]


@pytest.mark.parametrize(("text", "expected"), MQ_VALID)
def test_multi_query_parse_valid(text, expected):
    assert MQ.parse_step(text) == expected
    assert MQ.parse_step(MQ.render_step(expected)) == expected


@pytest.mark.parametrize(("text", "reason"), MQ_INVALID)
def test_multi_query_parse_invalid_reason(text, reason):
    with pytest.raises(FormatError) as caught:
        MQ.parse_step(text)
    assert caught.value.reason is reason


def test_multi_query_reaches_every_reason_it_can_give():
    assert {reason for _, reason in MQ_INVALID} == MQ_REASONS


def test_multi_query_limits_are_named_and_configurable():
    with pytest.raises(FormatError, match=r"5 base queries; at most 4 \(format_options\.max_base\)"):
        MQ.parse_step(mq_text("a", ["q"] * 5))
    with pytest.raises(FormatError, match=r"3 predicted queries; at most 2 \(format_options\.max_predicted\)"):
        MQ.parse_step(mq_text("a", ["q"], ["p"] * 3))
    narrow = get_format("multi_query", max_base=1, max_predicted=0)
    assert narrow.parse_step(mq_text("a", ["q"])) == Step("a", queries=("q",))
    with pytest.raises(FormatError, match=r"at most 1 \(format_options\.max_base\)") as caught:
        narrow.parse_step(mq_text("a", ["q1", "q2"]))
    assert caught.value.reason is FormatReason.MULTIPLE_QUERIES
    with pytest.raises(FormatError, match=r"format_options\.max_predicted"):
        narrow.parse_step(mq_text("a", ["q"], ["p"]))
    with pytest.raises(ValueError, match="max_base"):
        narrow.render_step(Step("a", queries=("q1", "q2")))
    wide = get_format("multi_query", max_base=6, max_predicted=3)
    six = Step("a", queries=tuple(f"q{i}" for i in range(6)), predicted=("p1", "p2", "p3"))
    assert wide.parse_step(wide.render_step(six)) == six
    with pytest.raises(ValueError):
        MQ.render_step(six)
    # the registry passes options through and rejects unknown or impossible ones
    assert (get_format("multi_query").max_base, get_format("multi_query").max_predicted) == (4, 2)
    with pytest.raises(ValueError, match="multi_query.*does not take the options.*bogus"):
        get_format("multi_query", bogus=1)
    with pytest.raises(ValueError, match="max_base must be at least 1"):
        get_format("multi_query", max_base=0)
    with pytest.raises(ValueError, match="max_predicted"):
        get_format("multi_query", max_predicted=-1)
    with pytest.raises(ValueError, match="format options go with a format name"):
        get_format(MQ, max_base=2)


def test_multi_query_steps_searches_and_finality():
    step = Step("a", queries=["b1", " b2 "], predicted=["p1"])  # lists become tuples, values are stripped
    assert step.queries == ("b1", "b2") and step.predicted == ("p1",) and not step.stop
    assert step.searches == ("b1", "b2", "p1") and not step.is_final
    with_stop = Step("a", queries=("b",), stop=True)
    assert with_stop.searches == ("b",) and not with_stop.is_final  # it still retrieves
    stop_only = Step("a", stop=True)
    assert stop_only.searches == () and stop_only.is_final
    assert Step("a", query="q").searches == ("q",) and Step("a", answer="x").searches == ()
    with pytest.raises(ValueError, match="not one string"):
        Step("a", queries="one query")
    for bad in (
        {"query": "q", "queries": ("b",)},
        {"answer": "x", "stop": True},
        {"query": "q", "predicted": ("p",)},
    ):
        with pytest.raises(ValueError, match="exactly one of"):
            Step("a", **bad)


def test_multi_query_render_layout_and_refusals():
    step = Step("Need both.", queries=("q1", "q2"), predicted=("p1",), stop=True)
    assert MQ.render_step(step) == (
        "<think>Need both.</think>\n<base-query>q1</base-query>\n<base-query>q2</base-query>\n"
        "<predicted-query>p1</predicted-query>\n<stop-retrieval>"
    )
    assert MQ.render_step(Step("Done.", stop=True)) == "<think>Done.</think>\n<stop-retrieval>"
    for bad in (
        Step("a", query="q"),  # single-query steps go through express
        Step("a", answer="x"),  # the steering model never answers
        Step("", queries=("q",)),  # no think block
        Step("a", queries=("q", "  ")),  # an empty query
        Step("a", queries=("q <stop-retrieval>",)),  # a tag inside a block
        Step("a </think>", queries=("q",)),
        Step("a", predicted=("p",)),  # predicted without base
        Step("a", queries=("q",) * 5),
        Step("a", queries=("q",), predicted=("p",) * 3),
    ):
        with pytest.raises(ValueError):
            MQ.render_step(bad)
    with pytest.raises(ValueError, match="never answers"):
        MQ.answer_only_prompt(with_documents=True)
    assert MQ.find_answer("<think>a</think><answer>Paris</answer>") is None
    assert "<base-query>" in MQ.system_prompt() and "<stop-retrieval>" in MQ.system_prompt()
    assert "<predicted-query>" not in get_format("multi_query", max_predicted=0).system_prompt()


def test_single_query_formats_refuse_a_multi_query_step():
    for step in (
        Step("a", queries=("q1", "q2")),
        Step("a", queries=("q",)),  # even one base query: it is not the single-query shape
        Step("a", queries=("q",), predicted=("p",)),
        Step("a", stop=True),
        Step("a", queries=("q",), stop=True),
    ):
        for name in ("r3", "tags", "react"):
            with pytest.raises(ValueError, match="multi_query"):
                get_format(name).render_step(step)


def test_multi_query_express_turns_a_single_query_step_into_one_base_query():
    assert MQ.express(Step("Need the director.", query="Silent Harbor director")) == Step(
        "Need the director.", queries=("Silent Harbor director",)
    )
    folded = MQ.express(Step("Now her birthplace.", query="Marta Kell birthplace", reflection="It names Kell."))
    assert folded == Step("It names Kell. Now her birthplace.", queries=("Marta Kell birthplace",))
    assert MQ.parse_step(MQ.render_step(folded)) == folded
    multi = Step("a", queries=("q",), stop=True)
    assert MQ.express(multi) is multi
    # an answer means enough was found: the stop signal (an answer-only step gets an analysis of its own)
    assert MQ.express(Step("Kell was born in Oslo.", answer="Oslo")) == Step("Kell was born in Oslo.", stop=True)
    stop = MQ.express(Step("", answer="Oslo", reflection="Born in Oslo."))
    assert stop == Step("Born in Oslo.", stop=True) and MQ.parse_step(MQ.render_step(stop)) == stop
    bare = MQ.express(Step("", answer="Oslo"))
    assert bare.stop and bare.analysis and MQ.parse_step(MQ.render_step(bare)) == bare


def test_multi_query_documents_and_context_question():
    docs = [Passage.from_title_text("g7", "Silent Harbor", "A 1955 film directed by Marta Kell."), Passage("x", "Bare")]
    shown = MQ.render_documents(docs, 2, 512)
    assert shown.startswith("Documents retrieved at step 2:\n\n[1] Silent Harbor\nA 1955 film")
    assert [(p.id, p.title, p.text) for p in MQ.parse_documents(shown)] == [
        ("1", "Silent Harbor", "A 1955 film directed by Marta Kell."),
        ("2", "Bare", ""),
    ]
    assert "no documents" in MQ.render_documents([], 1, 512)
    prompt = MQ.render_question("Where was the director of  Silent Harbor born?", docs, doc_chars=512)
    assert prompt == (
        "Question: Where was the director of Silent Harbor born?\n\nDocuments found so far:\n\n"
        "[1] Silent Harbor\nA 1955 film directed by Marta Kell.\n\n[2] Bare"
    )
    assert MQ.find_question(prompt) == "Where was the director of Silent Harbor born?"
    assert MQ.render_question("Q?") == "Question: Q?"  # no context, no heading


def test_the_question_reads_back_from_a_prompt_with_context(chat_tokenizers):
    context = [
        Passage.from_title_text("1", "Question: a decoy title", "Question: a decoy line in a document."),
        Passage.from_title_text("2", "Marta Kell", "Marta Kell (born 1921) is a Valdorian film director."),
    ]
    for name, tokenizer, template in chat_tokenizers:
        for fmt in ("r3", "multi_query"):
            renderer = ChatRenderer(tokenizer, fmt, chat_template=template)
            prompt = renderer.prompt("Who directed  Silent\nHarbor?", context)
            assert "Documents found so far:" in prompt and "Valdorian film director" in prompt, name
            assert renderer.question_of(prompt) == "Who directed Silent Harbor?", (name, fmt)


# property tests for multi_query

MQ_SOUP = st.sampled_from(
    [
        *MQ_TAGS,
        "<",
        ">",
        "</",
        "<think",
        "base-query>",
        "<predicted-query",
        "stop-retrieval",
        "<search>",
        "<answer>",
        "The final answer:",
        "\n",
        "\r\n",
        " ",
        "\t",
    ]
)
mq_pieces = st.lists(st.one_of(MQ_SOUP, st.text(max_size=10)), max_size=14).map("".join)
mq_block = st.one_of(
    st.tuples(
        st.sampled_from(["think", "base-query", "predicted-query"]), st.one_of(st.text(max_size=8), mq_pieces)
    ).map(lambda pair: f"<{pair[0]}>{pair[1]}</{pair[0]}>"),
    st.just("<stop-retrieval>"),
    MQ_SOUP,
    st.text(max_size=6),
)
mq_blocks = st.lists(mq_block, max_size=10).flatmap(
    lambda blocks: st.sampled_from(["", "\n", " ", "\n\n"]).map(lambda sep: sep.join(blocks))
)
# text with no tag in it: the content of a block (angle brackets and near-miss tags allowed)
tagless = (
    st.lists(
        st.one_of(
            st.text(st.characters(blacklist_categories=("Cs",)), max_size=20),
            st.sampled_from(["<", ">", "</", "<think", "base-query>", "</predicted", "stop-retrieval>", "\n", "\r\n"]),
        ),
        min_size=1,
        max_size=5,
    )
    .map("".join)
    .filter(lambda text: text.strip() and not any(tag in Step(text, stop=True).analysis for tag in MQ_TAGS))
)


mq_steps = st.builds(
    lambda analysis, base, predicted, stop: Step(
        analysis, queries=base, predicted=predicted if base else [], stop=stop or not base
    ),
    tagless,
    st.lists(tagless, max_size=5),
    st.lists(tagless, max_size=3),
    st.booleans(),
)


def _mutate(text: str, edits: list[tuple[int, int, str]]) -> str:
    """``text`` with each (position, deleted length, insertion) edit applied (positions taken modulo the length)."""
    for position, length, insertion in edits:
        position %= len(text) + 1
        text = text[:position] + insertion + text[position + length :]
    return text


# rendered steps (over the limits too), then cut, spliced and patched: near misses of the valid shape
mq_near_misses = st.builds(
    _mutate,
    mq_steps.map(lambda step: mq_text(step.analysis, step.queries, step.predicted, step.stop)),
    st.lists(st.tuples(st.integers(0, 400), st.integers(0, 12), st.one_of(MQ_SOUP, mq_block)), max_size=2),
)


@settings(max_examples=500, deadline=None)
@given(text=st.one_of(st.text(), mq_pieces, mq_blocks, mq_near_misses))
def test_multi_query_parse_raises_only_format_error(text):
    try:
        step = MQ.parse_step(text)
    except FormatError as error:
        assert error.reason in MQ_REASONS
        return
    # a parsed step is a well-formed expansion step, and it renders back to itself
    assert step.analysis and step.query is None and step.answer is None and step.reflection is None
    assert step.queries or step.stop
    assert len(step.queries) <= 4 and len(step.predicted) <= 2
    assert all(step.searches)
    assert MQ.parse_step(MQ.render_step(step)) == step


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_multi_query_render_then_parse_round_trips(data):
    max_base, max_predicted = data.draw(st.integers(1, 5)), data.draw(st.integers(0, 3))
    fmt = get_format("multi_query", max_base=max_base, max_predicted=max_predicted)
    base = data.draw(st.lists(tagless, max_size=max_base))
    predicted = data.draw(st.lists(tagless, max_size=max_predicted if base else 0))
    stop = data.draw(st.booleans()) if base else True  # a step writes at least one query or the stop signal
    step = Step(data.draw(tagless), queries=base, predicted=predicted, stop=stop)
    rendered = fmt.render_step(step)  # every step within the limits renders
    assert fmt.parse_step(rendered) == step
    assert fmt.read_turn(rendered, after_documents=bool(base)) == step  # the same at every position
    # one query over a limit: render refuses, and the hand-written text is a MULTIPLE_QUERIES error
    over = data.draw(st.sampled_from(["base", "predicted"]))
    extra_base = base + ["b"] * (max_base + 1 - len(base)) if over == "base" else base or ["b"]
    extra_predicted = predicted + ["p"] * (max_predicted + 1 - len(predicted)) if over == "predicted" else predicted
    too_many = Step(step.analysis, queries=extra_base, predicted=extra_predicted, stop=stop)
    with pytest.raises(ValueError, match=f"format_options.max_{over}"):
        fmt.render_step(too_many)
    with pytest.raises(FormatError, match=f"format_options.max_{over}") as caught:
        fmt.parse_step(mq_text(too_many.analysis, too_many.queries, too_many.predicted, stop))
    assert caught.value.reason is FormatReason.MULTIPLE_QUERIES


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(
    analysis=st.one_of(paragraph, mq_pieces),
    base=st.lists(st.one_of(line, mq_pieces), max_size=5),
    predicted=st.lists(st.one_of(line, mq_pieces), max_size=3),
    stop=st.booleans(),
)
def test_multi_query_render_refuses_or_round_trips_any_step(analysis, base, predicted, stop):
    """Any text at all (tags included): render_step either refuses the step or writes what parses back to it."""
    try:
        step = Step(analysis, queries=base, predicted=predicted, stop=stop)
    except ValueError:  # no action at all
        assume(False)
        return
    try:
        rendered = MQ.render_step(step)
    except ValueError:
        return
    assert MQ.parse_step(rendered) == step


@settings(max_examples=200, deadline=None)
@given(
    question=st.text(min_size=1, max_size=60).filter(lambda q: q.split()),
    docs=st.lists(st.tuples(st.text(max_size=20), st.text(max_size=80)), max_size=4),
    doc_chars=st.integers(1, 100),
    name=st.sampled_from(["r3", "tags", "react", "multi_query"]),
)
def test_render_question_with_context_then_find_question_round_trips(question, docs, doc_chars, name):
    fmt = get_format(name)
    context = [Passage.from_title_text(f"c{i}", title, text) for i, (title, text) in enumerate(docs)]
    prompt = fmt.render_question(question, context, doc_chars)
    assert fmt.find_question(prompt) == " ".join(question.split())
    assert ("Documents found so far:" in prompt) == bool(context)
    if context:
        shown = prompt.split("Documents found so far:\n\n", 1)[1]
        assert [p.title for p in parse_document_blocks(shown)] == [
            " ".join(p.title.split()) or "(untitled)" for p in context
        ]


MQ_TURNS = [
    Turn(Step("Two facts are needed.", queries=("Silent Harbor director", "Kiss and Tell director")), DOCS[:2]),
    Turn(Step("Now her birthplace.", queries=("Marta Kell birthplace",), predicted=("Valdoria capital",)), DOCS[2:]),
    Turn(Step("Everything is found.", stop=True)),
]


def test_multi_query_transcripts_are_prefix_consistent_and_match_the_rollout_assembly(chat_tokenizers):
    for name, tokenizer, template in chat_tokenizers:
        renderer = ChatRenderer(tokenizer, "multi_query", chat_template=template)
        ids = lambda text, tok=tokenizer: tok(text, add_special_tokens=False)["input_ids"]
        previous: list[int] = []
        for k in range(len(MQ_TURNS) + 1):
            current = ids(renderer.transcript(QUESTION, MQ_TURNS[:k]))
            assert current[: len(previous)] == previous, f"{name}: steps 1..{k - 1} are not a token prefix of 1..{k}"
            previous = current
        renderer.check_tokenization(QUESTION, MQ_TURNS)
        tokens = ids(renderer.prompt(QUESTION))
        for number, turn in enumerate(MQ_TURNS, start=1):
            tokens += ids(renderer.format.render_step(turn.step)) + renderer.stop_token_ids
            if not turn.step.is_final:
                tokens += ids(renderer.observation(turn.documents, number))
        assert tokens == previous, name
        steps = [
            MQ.parse_step(t.action)
            for t in renderer.split_response(renderer.transcript(QUESTION, MQ_TURNS)[len(renderer.prompt(QUESTION)) :])
        ]
        assert steps == [t.step for t in MQ_TURNS], name
