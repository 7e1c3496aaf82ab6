# Host round trips of the builds between 2982592 and 1721543 that changed code, every 15th of them, interleaved.
# Packed here: for r in 2982592 4cf94f4 a9e74b1 52e41ed b123992 7002207 58bbb2e 3a29d56 1721543; do git archive --format=tar.gz \
#   -o .gpu/builds/$(git log -1 --format=%ad --date=format:%m%d%H%M $r)_$r.tar.gz $r -- . ":!docs" ":!tests" ":!examples"; done
# (the same steps as run_ab.sh, which runs whatever .gpu/builds holds)
exec bash "$(dirname "$0")/run_ab.sh"
