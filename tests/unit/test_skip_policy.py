"""The skip rule (``tests/skip_policy.py``) on small test files run by a pytest of their own: a
skip for any reason but the ``gpu`` and ``slow`` markers fails the run, naming the test and the
reason; an xfail fails it too; the markers' own skips leave it green."""

from __future__ import annotations

import pytest
import skip_policy


@pytest.fixture
def run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    """Run pytest on ``source`` with the rule as its only plugin, on a machine without a GPU."""
    monkeypatch.setattr(skip_policy, "cuda_available", lambda: False)
    monkeypatch.delenv("RL_TRAIN_RUN_SLOW", raising=False)

    def run_source(source: str, *args: str) -> pytest.RunResult:
        pytester.makeini("[pytest]\nmarkers =\n    gpu: needs a GPU\n    slow: minutes\n")
        pytester.makepyfile(test_sample=source)
        # (the rule's module is imported already, by tests/conftest.py: it is not rewritten again)
        plugin = ["-p", "skip_policy", "-W", "ignore::pytest.PytestAssertRewriteWarning"]
        return pytester.runpytest_inprocess(*plugin, "-p", "no:cacheprovider", "-rA", *args)

    return run_source


def test_a_bare_skip_fails_the_run_naming_the_test_and_its_reason(run) -> None:
    result = run(
        """
        import pytest

        def test_transport():
            pytest.skip("libibverbs.so.1 is missing; install: apt-get install -y libibverbs1")

        def test_other():
            pass
        """
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        ["*test_sample.py::test_transport was skipped (libibverbs.so.1 is missing; install: apt-get*"]
    )


def test_skip_and_skipif_marks_and_a_skip_in_a_fixture_fail(run) -> None:
    result = run(
        """
        import pytest

        @pytest.fixture
        def engine():
            pytest.skip("sglang is not installed")

        @pytest.mark.skip(reason="not today")
        def test_marked():
            pass

        @pytest.mark.skipif(True, reason="megatron.core is not installed")
        def test_skipif():
            pass

        @pytest.mark.parametrize("transport", [pytest.param("mooncake", marks=pytest.mark.skip(reason="unavailable"))])
        def test_param(transport):
            pass

        def test_fixture(engine):
            pass
        """
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(errors=4)  # all four skipped in setup, where a failure is an error
    result.stdout.fnmatch_lines_random(
        [
            "*::test_marked was skipped (not today)*",
            "*::test_skipif was skipped (megatron.core is not installed)*",
            "*::test_param?mooncake? was skipped (unavailable)*",
            "*::test_fixture was skipped (sglang is not installed)*",
        ]
    )


def test_a_module_that_skips_itself_on_a_failed_import_is_a_collection_error(run) -> None:
    result = run(
        """
        import pytest

        pytest.importorskip("megatron_core_that_is_not_there")

        def test_engine():
            pass
        """
    )
    assert result.ret == pytest.ExitCode.INTERRUPTED  # pytest stops at a collection error
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        ["*test_sample.py skipped itself while being collected (could not import 'megatron_core_that_is_not_there'*"]
    )


def test_xfail_is_no_way_round_it(run) -> None:
    result = run(
        """
        import pytest

        @pytest.mark.xfail(reason="known bug")
        def test_fails_as_expected():
            assert False

        @pytest.mark.xfail(reason="known bug")
        def test_passes_anyway():
            pass

        def test_calls_xfail():
            pytest.xfail("later")
        """
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(failed=3)
    result.stdout.fnmatch_lines_random(
        [
            "*::test_fails_as_expected xfailed (known bug)*",
            "*::test_passes_anyway passed although marked xfail (known bug)*",
            "*::test_calls_xfail xfailed (later)*",
        ]
    )


MARKED = """
import pytest

@pytest.mark.gpu
@pytest.mark.skipif(True, reason="sglang is not installed")
def test_on_gpu():
    assert False, "ran"

@pytest.mark.slow
def test_learns():
    assert False, "ran"

def test_fast():
    pass
"""


def test_the_gpu_and_slow_markers_skip_and_the_run_stays_green(run) -> None:
    result = run(MARKED)
    assert result.ret == pytest.ExitCode.OK
    result.assert_outcomes(passed=1, skipped=2)
    # the marker skips first: the GPU is the reason given, not the package a GPU machine would need
    result.stdout.fnmatch_lines_random([f"SKIPPED * {skip_policy.GPU_REASON}", f"SKIPPED * {skip_policy.SLOW_REASON}"])


def test_asked_for_slow_runs_and_a_gpu_present_the_markers_skip_nothing(
    run, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(skip_policy, "cuda_available", lambda: True)
    monkeypatch.setenv("RL_TRAIN_RUN_SLOW", "1")
    result = run(MARKED)
    result.assert_outcomes(passed=1, failed=1, errors=1)  # test_learns ran and failed
    # on a GPU machine without sglang, the sglang test fails: its skip is no longer the marker's
    result.stdout.fnmatch_lines_random(["*::test_on_gpu was skipped (sglang is not installed)*", "*ran*"])
