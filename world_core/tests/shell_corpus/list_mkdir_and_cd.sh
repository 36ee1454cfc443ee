mkdir proj && cd proj && echo inside > f.txt
cd ..
cat proj/f.txt
