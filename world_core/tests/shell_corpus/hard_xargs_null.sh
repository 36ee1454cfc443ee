mkdir -p d
touch 'd/a b' d/c
find d -type f -print0 | sort -z | xargs -0 -n1 echo
