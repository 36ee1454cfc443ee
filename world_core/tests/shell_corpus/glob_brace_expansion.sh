echo {a,b,c}.txt
echo file{1..4}
mkdir -p d/{x,y}
ls d
