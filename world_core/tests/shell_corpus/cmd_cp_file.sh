echo content > src.txt
cp src.txt dst.txt
cat dst.txt
