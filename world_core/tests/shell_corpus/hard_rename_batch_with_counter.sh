touch img_a.png img_b.png
n=1
for f in img_*.png; do mv "$f" "photo_$n.png"; n=$((n+1)); done
ls
