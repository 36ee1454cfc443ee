shopt -s globstar
mkdir -p g/h
touch g/a.md g/h/b.md
echo **/*.md
