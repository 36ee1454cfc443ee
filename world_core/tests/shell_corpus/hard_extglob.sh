shopt -s extglob
touch a.txt b.log c.md
echo !(*.txt)
