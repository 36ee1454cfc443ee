mkdir -p docs
echo 'Old name here' > docs/a.md
echo 'Old name there' > docs/b.md
grep -rl 'Old name' docs | sort | xargs sed -i 's/Old name/New name/'
cat docs/a.md docs/b.md
