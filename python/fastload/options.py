"""The choices and limits of options that the API checks and the command line offers: listed once
here, so `fastload pack --resize` or `fastload train --amp` can never accept what `pack` or `fit`
refuse (or the reverse). Needs neither torch nor the extension, so `fastload --help` stays fast."""

#: `pack(resize=...)`: stretch, scale the short side and cut the centre, or letterbox.
RESIZE_MODES = ("squash", "crop", "pad")
#: Largest labels CSV `pack` reads (its text is held in memory); every name must fit the
#: store's 64 MiB metadata anyway.
MAX_LABELS_CSV_BYTES = 128 << 20
#: Largest `--runs-file` (`train.read_runs_file`): a list of runs' options, a few bytes each.
MAX_RUNS_FILE_BYTES = 1 << 20
#: Most runs a `fit_many` group (`fastload train --runs N`, `--runs-file`) trains at once: each
#: builds a model and an optimizer before the first batch, and takes its step on every batch.
MAX_RUNS = 1024
#: Largest checkpoint `fit(resume=...)` / `--resume` reads (torch.load streams it from the file).
MAX_CHECKPOINT_BYTES = 64 << 30
#: Largest `.npy` of monotone inputs (`fit(monotone_inputs=...)`, `--monotone-inputs`), read whole:
#: 500 million float64 scalars, far more than one per record of any store with a few per record.
MAX_MONOTONE_INPUTS_BYTES = 4 << 30
#: `fit(amp=...)`: mixed precision off, or autocast to bfloat16 / float16.
AMP_MODES = ("off", "bf16", "fp16")
#: `fit(schedule=...)`: learning-rate schedules.
SCHEDULES = ("cosine", "constant")
#: `fit(task=...)`: what the labels are (None: classification when the store lists classes).
TASKS = ("regression", "classification")
#: `fit(backbone=...)` by name (a torch module is accepted too).
BACKBONES = ("small-cnn", "resnet18")
#: `demo.run(images_from=...)`: scikit-image's sample photos when it is installed (auto), those
#: photos (refused without scikit-image), or procedural textures (the same run whatever is installed).
DEMO_SOURCES = ("auto", "photos", "textures")
