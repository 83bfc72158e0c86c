#!/bin/sh
# Make the whole gallery: every experiment at full size, each into figures/NAME/
# (results.nc, the PNG and PDF figures, animations). A finished experiment is skipped
# when run again; an interrupted one resumes from its finished pieces.
#
#   sh experiments/all_figures.sh                  # all of them
#   sh experiments/all_figures.sh circle causal    # some of them
#
# diffeqformer trains its two models first when runs/diffeqformer lacks them (~25 min).
# The two phase diagrams are long on a CPU (hours; phase_diagram_random days on 2 cores):
# run them on a GPU, or give them members=... and beta='${linspace:0.1,9,30}'.
# noise_transition takes about half an hour on 2 cores (8 runs of 1024 steps at n = 1e6,
# summed in harmonics), meanfield_circle about 4 minutes (n = 1e6, harmonics too).
set -e
cd "$(dirname "$0")/.."
# Every experiment attnflow ships: the names of conf/experiment/*.yaml (the one list of them).
names="${*:-$(for f in conf/experiment/*.yaml; do basename "$f" .yaml; done)}"
for name in $names; do
    echo "== $name"
    # the interactive views load plotly.min.js from their folder (the site puts one there)
    attnflow "experiment=$name" "hydra.run.dir=figures/$name" plotly_js=directory
done
