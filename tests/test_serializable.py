"""SerializableFunc: functions pickled by module and name, found again in another process, scripts included."""

import json
import pickle
import subprocess
import sys
import textwrap

import pytest

import lazyseq

SCRIPT = textwrap.dedent(
    """
    import pickle
    import sys

    import lazyseq

    @lazyseq.SerializableFunc
    def double(x):
        return 2 * x

    def triple(x):
        return 3 * x

    class Scale:
        @staticmethod
        def by_ten(x):
            return 10 * x

    if __name__ == "__main__":
        functions = [double, lazyseq.SerializableFunc(triple), lazyseq.SerializableFunc(Scale.by_ten)]
        with open(sys.argv[1], "wb") as file:
            pickle.dump(functions, file)
        with open(sys.argv[2], "wb") as file:
            pickle.dump(triple, file)  # plain pickle: a reference to __main__.triple
        print("pickled")
    """
)

LOAD = """
import pickle, sys
with open(sys.argv[1], "rb") as file:
    functions = pickle.load(file)
print([f(7) for f in functions], functions)
"""


def run(*args):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120)


def test_functions_of_a_script_are_found_again_in_another_process(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    wrapped, plain = tmp_path / "wrapped.pkl", tmp_path / "plain.pkl"
    made = run(str(script), str(wrapped), str(plain))
    assert made.returncode == 0, made.stderr
    assert made.stdout == "pickled\n"

    loaded = run("-c", LOAD, str(wrapped))  # another __main__: the script is loaded from its path
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout == (  # and the script's __main__ block did not run there
        "[14, 21, 70] [SerializableFunc(__main__.double), SerializableFunc(__main__.triple), "
        "SerializableFunc(__main__.Scale.by_ten)]\n"
    )
    failed = run("-c", LOAD, str(plain))
    assert "Can't get attribute 'triple' on <module '__main__'" in failed.stderr


def test_a_spawned_process_unpickles_it(tmp_path):
    script = tmp_path / "spawn_script.py"
    script.write_text(
        SCRIPT.replace(
            'if __name__ == "__main__":',
            textwrap.dedent(
                """
                def apply(f, x):
                    return f(x)

                if __name__ == "__main__" and sys.argv[1] == "spawn":
                    import multiprocessing
                    with multiprocessing.get_context("spawn").Pool(1) as pool:
                        print(pool.apply(apply, (lazyseq.SerializableFunc(triple), 5)), pool.apply(apply, (double, 5)))
                    sys.exit()

                if __name__ == "__main__":"""
            ),
        )
    )
    done = run(str(script), "spawn")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "15 10\n"


def test_in_this_process_it_calls_and_round_trips():
    dumps = lazyseq.SerializableFunc(json.dumps)
    assert dumps([1, 2]) == "[1, 2]" and dumps.__name__ == "dumps" and dumps.__wrapped__ is json.dumps
    again = pickle.loads(pickle.dumps(dumps))
    assert again.func is json.dumps and repr(again) == "SerializableFunc(json.dumps)"
    assert lazyseq.SerializableFunc(dumps).func is json.dumps
    assert repr(lazyseq.smap(dumps, [1])).startswith("smap(dumps)")


def local_function_maker():
    def inner(x):
        return x

    return inner


@pytest.mark.parametrize(
    "func, name",
    [(lambda x: x, "<lambda>"), (local_function_maker(), "local_function_maker.<locals>.inner")],
)
def test_functions_without_a_name_to_find_them_by_are_refused(func, name):
    with pytest.raises(ValueError) as info:
        lazyseq.SerializableFunc(func)
    assert str(info.value) == (
        f"SerializableFunc: {__name__}.{name} cannot be found again by its name in another process: "
        "define the function at the top level of a module or script"
    )
    with pytest.raises(TypeError, match=r"^SerializableFunc needs a function, got int$"):
        lazyseq.SerializableFunc(3)


def test_a_function_of_a_main_without_file_cannot_be_pickled():
    code = textwrap.dedent(
        """
        import pickle, lazyseq
        def f(x):
            return x
        g = lazyseq.SerializableFunc(f)
        print(g(4))
        try:
            pickle.dumps(g)
        except pickle.PicklingError as error:
            print(error)
        """
    )
    done = run("-c", code)
    assert done.returncode == 0, done.stderr
    assert done.stdout == (
        "4\nSerializableFunc: f is defined in __main__, which has no file (an interactive session, a notebook, "
        "python -c or a script read from standard input), so no other process can find it by name: define it in "
        "a module or a script file\n"
    )
