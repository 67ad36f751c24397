// Does TDPBF16PS equal some fp32 emulation? (session 24, issue 14: an AVX-512 one-token path for the amx tier would
// have to give AMX's bits to keep the tier batch-invariant.) Random bf16 tiles, 8 steps of 16 x 32 x 16, C from
// random fp32; four candidate emulations counted against the hardware's result, bit for bit. Measured on a
// Sapphire Rapids-class Xeon: per step one rounding of the exact sum 15592 / 51200 mismatches, per pair one
// rounding 37361, pairs rounded then summed in fp32 10136, per step toward zero 46519; (an earlier version:
// sequential fp32 adds even-odd or odd-even ~37800): none is AMX's arithmetic.
//   g++ -O2 -std=c++20 -ffp-contract=off scripts/perf/amx_rounding_probe.cpp -o /tmp/probe && /tmp/probe
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <cmath>
#include <random>
struct alignas(64) Cfg { uint8_t p=1,s=0; uint8_t r[14]={}; uint16_t cb[16]={}; uint8_t rows[16]={}; };
static Cfg cf;
__attribute__((target("amx-tile,amx-bf16,avx512f")))
void run(const uint16_t* A,const uint16_t* B,float* C,int steps){
  for(int t=0;t<8;++t){cf.cb[t]=64;cf.rows[t]=16;} asm volatile("":::"memory"); _tile_loadconfig(&cf);
  _tile_loadd(0,C,64);
  for(int s=0;s<steps;++s){ _tile_loadd(4,A+s*512,64); _tile_loadd(6,B+s*512,64); _tile_dpbf16ps(0,4,6);}
  _tile_stored(0,C,64); _tile_release();
}
static float f(uint16_t h){ uint32_t u=uint32_t(h)<<16; float x; memcpy(&x,&u,4); return x;}
int main(){
  if(syscall(SYS_arch_prctl,0x1023,18)) return 1;
  std::mt19937 g(1); std::normal_distribution<float> nd;
  const int steps=8; // A: [step][16 rows][32 k] ; B: [step][16 pairrows kk][16 tokens][2]
  static uint16_t A[steps*512],B[steps*512]; static float C[256],C0[256];
  auto bf=[&](float x){uint32_t u; memcpy(&u,&x,4); return uint16_t(u>>16);};  // truncation fine: any bf16 values
  int mism[4]={0,0,0,0}; long total=0;
  for(int trial=0;trial<200;++trial){
    float scale = trial%4==0?1e3f:1.f;
    for(auto& a:A) a=bf(nd(g)*scale); for(auto& b:B) b=bf(nd(g));
    for(int i=0;i<256;++i) C0[i]=C[i]=nd(g)*(trial%2?100.f:0.01f);
    run(A,B,C,steps);
    for(int m=0;m<16;++m) for(int n=0;n<16;++n){
      float e[4]; for(int v=0;v<4;++v) e[v]=C0[m*16+n];
      for(int s=0;s<steps;++s){ double st=0; double pr[16];
        for(int kk=0;kk<16;++kk){
        float a0=f(A[s*512+m*32+2*kk]),a1=f(A[s*512+m*32+2*kk+1]);
        float b0=f(B[s*512+kk*32+2*n]),b1=f(B[s*512+kk*32+2*n+1]);
        st += (double)a0*b0+(double)a1*b1; pr[kk]=(double)a0*b0+(double)a1*b1;
        e[1]=(float)((double)e[1]+(double)a0*b0+(double)a1*b1);  // per pair: acc + both, one rounding
        }
        e[0]=(float)((double)e[0]+st);  // per step one rounding
        // per step, pairs rounded to fp32 then summed in fp32 sequentially, then added
        float ps=0; for(int kk=0;kk<16;++kk) ps+= (float)pr[kk]; e[2]=e[2]+ps;
        // per step round-toward-zero of exact sum
        { double x=(double)e[3]+st; float r=(float)x; if (std::fabs((double)r)>std::fabs(x)) r=std::nextafter(r,0.f); e[3]=r; }
      }
      for(int v=0;v<4;++v){ uint32_t x,y; memcpy(&x,&e[v],4); memcpy(&y,&C[m*16+n],4); if(x!=y) mism[v]++; }
      total++;
    }
  }
  printf("total %ld mismatches: step-once %d, pair-once %d, step-fp32-pairs %d, step-rtz %d\n",total,mism[0],mism[1],mism[2],mism[3]);
}
