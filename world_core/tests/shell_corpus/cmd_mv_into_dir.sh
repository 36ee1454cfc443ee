mkdir dest
touch f1 f2
mv f1 f2 dest/
ls dest
