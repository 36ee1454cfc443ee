mkdir -p proj/{src,tests,docs}
for d in src tests; do printf '# %s\n' "$d" > "proj/$d/__init__.py"; done
printf '[project]\nname = "demo"\n' > proj/pyproject.toml
find proj | sort
cat proj/src/__init__.py
