arr=(apple.txt berry.txt cherry.md)
echo "${arr[@]%.txt}"
echo "${arr[@]/e/E}"
