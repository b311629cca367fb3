"""lm-evaluation-harness on a trained model: ``spherenet-eval`` or ``python -m recipes.evaluate``.

    spherenet-eval --model spherenet --model_args path=runs/x \\
        --tasks arc_easy,hellaswag,winogrande,lambada_openai --device cpu
    spherenet-eval --model spherenet --model_args path=exported/ngpt,dtype=bfloat16 --batch_size 16 \\
        --tasks hellaswag --num_fewshot 0 --output_path results/

Takes exactly ``lm_eval``'s arguments (``spherenet-eval --help``): it registers the
``spherenet`` model (:mod:`recipes.lm_eval_model`) and then runs ``lm_eval``'s own command
line, which does not discover models of other packages by itself. Datasets are fetched by
``lm_eval`` from the Hugging Face Hub (or read from its cache). Needs
``pip install "spherenet[eval]"``.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    try:  # registers the "spherenet" model; without lm_eval, an error naming the extra to install
        import recipes.lm_eval_model  # noqa: F401
    except ImportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from lm_eval.__main__ import cli_evaluate

    if argv is not None:  # lm_eval's command line reads sys.argv itself
        sys.argv = [sys.argv[0], *argv]
    cli_evaluate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
