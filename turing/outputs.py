"""Output folders of the tools: what an earlier run left there is refused unless --overwrite, so
that no tool replaces another run's files without a word."""
import os


def earlier_output(output_dir, overwrite, error_type, advice):
    """The names in `output_dir` (none when it does not exist yet); `error_type` naming the folder
    and what is in it when it holds any and not `overwrite` (`advice` says what to do), or when
    it is a file."""
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise error_type(f"--output_dir {output_dir} exists and is not a folder")
    present = sorted(os.listdir(output_dir)) if os.path.isdir(output_dir) else []
    if present and not overwrite:
        raise error_type(f"--output_dir {output_dir} is not empty ({', '.join(present[:4])}"
                         f"{', ...' if len(present) > 4 else ''}); {advice}")
    return present
